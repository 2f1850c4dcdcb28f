"""``python -m composer_fn``: the same as the ``composer-fn`` command."""

from composer_fn.app.cli import main

raise SystemExit(main())
