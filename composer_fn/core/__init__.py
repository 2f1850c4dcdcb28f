"""Pure records and functions: time, events, keys, state, the algorithm contract, passes and the engine."""
