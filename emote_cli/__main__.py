"""Allow ``python -m emote_cli`` as an alternative to the ``emote`` console script."""

from __future__ import annotations

from emote_cli.app import main

if __name__ == "__main__":
    main()
