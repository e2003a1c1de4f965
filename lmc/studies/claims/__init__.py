"""A paper's claims and their verdicts: the claims as declared in a study file
(:mod:`.declared`), their statistics (:mod:`.inference`), the verdicts over a study's replicates
(:mod:`.verdicts`), and the evidence kept beside them from which anyone recomputes each
verdict (:mod:`.evidence`)."""
