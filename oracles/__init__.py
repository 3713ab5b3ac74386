"""The oracle: where every byte lives (layouts), what a transfer must produce (transfer),
and what each entry point must accept (contract)."""
