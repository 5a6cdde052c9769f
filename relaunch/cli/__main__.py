"""``python -m relaunch.cli``: the `relaunch` command."""

from relaunch.cli.main import main

if __name__ == "__main__":
    main()
