"""`python -m lablib.instructor --out DIR ...`: the run-all (lablib.instructor.run)."""
import sys

from .run import main

sys.exit(main())
