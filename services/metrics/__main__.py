"""``python -m services.metrics``."""

from services.metrics.app import main

main()
