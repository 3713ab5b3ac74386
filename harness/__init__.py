"""The harness: case model, generation, materialize/compare/classify, campaigns, workers, reproducers, CLI."""
