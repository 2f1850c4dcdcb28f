"""Pure records and functions: time, events, keys, state, the algorithm contract, passes, the engine, the run
schedule and its dry run, argument checks."""
