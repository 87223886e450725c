from commonos.journal_writer.service import main

raise SystemExit(main())
