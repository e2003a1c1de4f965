"""A study's results and report: the tidy results table (:mod:`.results`; imports pandas), its
means over replicates (:mod:`.aggregate`), the figures as declared (:mod:`.figure_spec`) and
drawn (:mod:`.figures`), the HTML/markdown report (:mod:`.report`) and the W&B report
(:mod:`.wandb_spec`, :mod:`.wandb_report`)."""
