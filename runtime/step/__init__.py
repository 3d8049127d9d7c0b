"""The step path and its state: the engine loop (loop.py) runs plan -> forward -> sample ->
process on its own thread. The scheduler plans (scheduler.py, schedule_policy.py) over the
requests' state (request.py); contract.py declares what passes between the stages; the plan is
laid out for the device as a ForwardBatch (forward_batch.py); the output processor applies the
chosen tokens (output_processor.py); timing.py measures where the loop's time goes."""
