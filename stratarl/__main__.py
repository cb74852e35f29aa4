"""`python -m stratarl ...` runs the command-line interface."""

from stratarl.cli import main

raise SystemExit(main())
