
j 
	gpt2-tiny"dH