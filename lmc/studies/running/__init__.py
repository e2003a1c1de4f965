"""Planning and running a study: the grid into jobs (:mod:`.plan`), the study folder, its job
records and lock (:mod:`.store`), the run itself (:mod:`.run`), one job (:mod:`.execute`), where
jobs run (:mod:`.executors`: in process, local workers, submitit), populations chosen
automatically (:mod:`.auto_population`) and studies sized by their claims (:mod:`.replicates`)."""
