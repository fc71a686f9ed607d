
/jobs/x.bin