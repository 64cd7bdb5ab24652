"""`speculative-t5 walltime_table` as a script (the drivers live in speculative_t5/paper/):
  python experiments/walltime_table.py --cell configs/paper/ende_t5_small_t0.gin [--cell ...] \
      --output_dir runs/walltime_table [--gin_file=my_checkpoints.gin] [--gin.NUM_EXAMPLES=500]"""
import sys

from speculative_t5.commands import main

if __name__ == "__main__":
    sys.exit(main(["walltime_table", *sys.argv[1:]]))
