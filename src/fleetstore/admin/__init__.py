"""The operator tools as logic without click: doctor, maintain, lock, top, stats
(what sessions and stats read), and the handlers of worker."""
