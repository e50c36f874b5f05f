"""``python -m genalign.toy.generators``: see :mod:`genalign.toy.generators.cli`."""

from genalign.toy.generators.cli import main

raise SystemExit(main())
