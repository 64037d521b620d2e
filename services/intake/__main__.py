"""``python -m services.intake``: run intake until SIGINT/SIGTERM, configured from the environment
(``NATS_URL``, ``MDQ_NAMESPACE``, ``MDQ_INTAKE_*``)."""

from __future__ import annotations

from mdq.bus.runtime import LEVEL_FORMAT, Service, serve
from services.intake.app import IntakeSettings, build_intake


def main() -> None:
    settings = IntakeSettings()

    async def compose(service: Service) -> None:
        # intake opens its two connections itself (the entrances' and the writes'), with the
        # same identity and waiting as ``Service.connect``: a flood queues in the first only
        intake = build_intake(common=service.common, settings=settings)
        service.part("intake", intake.run)

    serve("intake", compose, level=settings.log_level, fmt=LEVEL_FORMAT)


if __name__ == "__main__":
    main()
