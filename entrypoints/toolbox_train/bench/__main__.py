import sys

from toolbox_train.bench.command import main

sys.exit(main())
