from numapin.cli import main

raise SystemExit(main())
