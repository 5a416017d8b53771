"""``python -m rmq_source``: the ``rmq-store`` command line (see :mod:`rmq_source.cli`)."""
import sys

from rmq_source.cli import main

sys.exit(main())
