from commonos.billing.service import main

raise SystemExit(main())
