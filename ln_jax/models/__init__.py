"""Model families (one sub-package each) and their tasks."""
