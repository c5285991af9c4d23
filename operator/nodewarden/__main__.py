"""`python -m nodewarden` is the `nodewarden` command."""

from nodewarden.cli import main

raise SystemExit(main())
