# Checkpoint script tests. Included (OPTIONAL) from tests/CMakeLists.txt.

# SIGKILL the trainer at random moments during saves, 20 times: every restart resumes from the newest complete
# checkpoint and the finished run's losses equal an uninterrupted run's, bit for bit (about 20 s).
add_test(NAME checkpoint_kill_test COMMAND bash ${CMAKE_SOURCE_DIR}/scripts/kill_test.sh $<TARGET_FILE:mxtrain> 20)
set_tests_properties(checkpoint_kill_test PROPERTIES TIMEOUT 120 LABELS checkpoint)

# SIGTERM mid-run: the step ends, a checkpoint is saved, exit status 75; the rerun resumes bit for bit.
add_test(NAME checkpoint_stop_signal COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/stop_signal.sh $<TARGET_FILE:mxtrain>)
set_tests_properties(checkpoint_stop_signal PROPERTIES TIMEOUT 120 LABELS checkpoint)
