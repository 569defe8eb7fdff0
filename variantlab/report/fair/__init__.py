"""The fair-comparison parts of the report: variants compared at their own best setting
(:mod:`.tuned`), the tuned table, the loss-vs-setting plot and the ranking flips
(:mod:`.compare`), and the views over model size (:mod:`.scaling`); see
docs/fair-comparisons.md."""
