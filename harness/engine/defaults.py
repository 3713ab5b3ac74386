"""The engine's defaults, in a module without imports so that the fuzz options (commands/fuzz_options.py) can
show them without importing torch at ``fuzz --help`` time; mix.py and scale.py take them from here."""

# The case mix of a GPU campaign (mix.py): transfers, inputs the contract rejects, empty index lists.
DEFAULT_MIX_TEXT = "transfer=0.7,reject=0.28,empty=0.02"
# The scale tier's share of a GPU campaign's time (scale.py).
DEFAULT_SCALE_SHARE = 0.15
