"""`python -m torchneuron.doctor script.py [args]`: see torchneuron/profiler/doctor.py."""
import sys

from .profiler.doctor import main

if __name__ == "__main__":
    sys.exit(main())
