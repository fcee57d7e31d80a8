"""``python -m medadv`` (and ``torchrun -m medadv``): the command-line interface."""

from .cli import main

if __name__ == "__main__":
    raise SystemExit(main())
