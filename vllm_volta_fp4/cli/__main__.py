"""``python -m vllm_volta_fp4.cli`` runs ``volta-fp4``."""

import sys

from vllm_volta_fp4.cli import main

sys.exit(main())
