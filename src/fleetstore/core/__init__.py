"""Values every layer shares: ids, settings, metrics, argument checks, store targets."""
