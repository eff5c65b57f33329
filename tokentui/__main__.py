from tokentui.cli import main

raise SystemExit(main())
