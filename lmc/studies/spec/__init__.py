"""The study file and its checks: its schema and the errors it raises (:mod:`.schema`), reading
and checking one (:mod:`.load`), its grid keys against the base configs through the CLI's parser
(:mod:`.check`), and dotted config keys (:mod:`.keys`)."""
