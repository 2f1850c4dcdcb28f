"""The application layer: the ``composer-fn`` command line (``python -m composer_fn``), recipe files, pictures of
runs and Pareto sweeps.

It is built on the library (the trainer, the algorithms, the data and models) and the library never imports it:
``composer_fn.app.cli`` (the command), ``composer_fn.app.recipes`` (runs written as TOML),
``composer_fn.app.report`` (a run's log drawn as one picture) and ``composer_fn.app.pareto`` (sweeps of recipes,
lengths and seeds, and their Pareto table). Its public names live in those modules.
"""

__all__: list[str] = []
