from commonos.console.service import main

raise SystemExit(main())
