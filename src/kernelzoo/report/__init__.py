"""The presentation of an analysis: report.md, the figures, the CSV tables and the wandb
dashboard, each written from an ``analysis.pipeline.Analysis``; nothing here reads a store."""
