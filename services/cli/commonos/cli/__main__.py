"""`python -m commonos.cli ...` is `cos ...` (for images and jobs that call Python directly)."""

from commonos.cli.main import main

raise SystemExit(main())
