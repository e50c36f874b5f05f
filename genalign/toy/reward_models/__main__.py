"""``python -m genalign.toy.reward_models``: see :mod:`genalign.toy.reward_models.cli`."""

from genalign.toy.reward_models.cli import main

raise SystemExit(main())
