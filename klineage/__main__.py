from klineage.cli import main

raise SystemExit(main())
