"""``python -m services.intake``: run intake until SIGINT/SIGTERM, configured from the environment
(``NATS_URL``, ``MDQ_NAMESPACE``, ``MDQ_INTAKE_*``)."""

from __future__ import annotations

import logging

from mdq.bus.runtime import run_service
from services.intake.app import build_intake


def main() -> None:
    intake = build_intake()
    logging.basicConfig(
        level=intake.settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    run_service(intake.run)


if __name__ == "__main__":
    main()
