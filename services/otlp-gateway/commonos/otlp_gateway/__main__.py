from commonos.otlp_gateway.service import main

raise SystemExit(main())
