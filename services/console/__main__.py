"""``python -m services.console``."""

from services.console.app import main

if __name__ == "__main__":  # not in the simulation page's spawned processes, which import it
    main()
