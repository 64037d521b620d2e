"""``python -m services.intake``: run intake until SIGINT/SIGTERM, configured from the environment
(``NATS_URL``, ``MDQ_NAMESPACE``, ``MDQ_INTAKE_*``)."""

from __future__ import annotations

from mdq.bus.runtime import LEVEL_FORMAT, configure_logging, run_service
from services.intake.app import build_intake


def main() -> None:
    intake = build_intake()
    configure_logging(intake.settings.log_level, fmt=LEVEL_FORMAT)
    run_service(intake.run)


if __name__ == "__main__":
    main()
