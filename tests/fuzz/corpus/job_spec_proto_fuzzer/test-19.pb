
gpt5