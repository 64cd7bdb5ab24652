"""`speculative-t5 gamma_sweep` as a script (the drivers live in speculative_t5/paper/):
  python experiments/gamma_sweep.py --cell configs/paper/ende_t5_small_t0.gin [--cell ...] \
      --output_dir runs/gamma_sweep [--gin_file=my_checkpoints.gin] [--gin.NUM_EXAMPLES=500]"""
import sys

from speculative_t5.commands import main

if __name__ == "__main__":
    sys.exit(main(["gamma_sweep", *sys.argv[1:]]))
