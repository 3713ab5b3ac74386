"""The engine's defaults, in a module without imports so that the fuzz options (commands/fuzz_options.py) can
show them without importing torch at ``fuzz --help`` time; mix.py and scale.py take them from here."""

# The case mix of a GPU campaign (mix.py): transfers, inputs the contract rejects, empty index lists.
DEFAULT_MIX_TEXT = "transfer=0.7,reject=0.28,empty=0.02"
# The scale tier's share of a GPU campaign's time (scale.py).
DEFAULT_SCALE_SHARE = 0.15
# A process feed's children (feed_process.py), one core each. One child generates about as fast as a GPU pool
# consumes cases of the narrow spaces; the whole-range spaces (longer index lists, sequence programs) cost about
# twice that to generate, so two where the machine has the cores for them beside the pool's workers, the
# campaign parent and the JIT builder.
AUTO_FEED_PROCESSES_MIN_CORES = 8
MAX_FEED_PROCESSES = 8
AUTO_FEED_PROCESSES_TEXT = f"2 on a machine of {AUTO_FEED_PROCESSES_MIN_CORES}+ cores, else 1"
