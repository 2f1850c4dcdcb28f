"""composer_fn: faster training by composing speed-up methods as pure functions over immutable state."""
