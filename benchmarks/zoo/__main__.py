"""``python -m benchmarks.zoo``: the zoo runner (``benchmarks/zoo/run.py``)."""

from benchmarks.zoo.run import main

main()
