from toolbox.cli import main

raise SystemExit(main())
