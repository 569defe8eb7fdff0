"""The fair-comparison parts of the report: variants compared at their own best setting
(:mod:`.tuned`), the tuned table, the loss-vs-setting plot and the ranking flips
(:mod:`.compare`), the views over model size (:mod:`.scaling`), and the extension of
tuned axes beyond an edge where a best sits (:mod:`.extension`); see
docs/fair-comparisons.md."""
