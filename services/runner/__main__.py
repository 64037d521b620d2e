"""``python -m services.runner``: run one attempt of the job described by the environment."""

from services.runner.app import main

raise SystemExit(main())
