"""The operator tools as logic without click: doctor, maintain, lock, stress, top, and
the handlers of worker."""
