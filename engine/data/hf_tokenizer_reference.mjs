// The reference hf_tokenizer_reference_test compares Ferry's hf tokenizer
// with: Hugging Face's own JavaScript implementation of tokenizer.json
// (@huggingface/tokenizers), run with Node.js on the same files and texts.
//
//   node hf_tokenizer_reference.mjs TOKENIZERS_JS TOKENIZER_JSON CONFIG_JSON|- TEXTS_JSON OUT_JSON
//
// TOKENIZERS_JS is the package's dist/tokenizers.mjs; TEXTS_JSON a JSON list
// of strings. Writes, for each text, a JSON object: `ids` (encode without
// special tokens), `special_ids` (with them, as tokenizer(text) adds them),
// `tokens` (the token strings of `ids`, for messages) and `decoded` (decode of
// `ids` with special tokens kept and no clean-up of spaces).
import { readFileSync, writeFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const [library, tokenizerPath, configPath, textsPath, outPath] = process.argv.slice(2);
const { Tokenizer } = await import(pathToFileURL(library).href);
const tokenizerJson = JSON.parse(readFileSync(tokenizerPath, "utf8"));
const config = configPath === "-" ? {} : JSON.parse(readFileSync(configPath, "utf8"));
const tokenizer = new Tokenizer(tokenizerJson, config);

const texts = JSON.parse(readFileSync(textsPath, "utf8"));
const results = texts.map((text) => {
  const plain = tokenizer.encode(text, { add_special_tokens: false });
  const special = tokenizer.encode(text, { add_special_tokens: true });
  const decoded =
    plain.ids.length === 0 ? "" : tokenizer.decode(plain.ids, { clean_up_tokenization_spaces: false });
  return { ids: plain.ids, special_ids: special.ids, tokens: plain.tokens, decoded };
});
writeFileSync(outPath, JSON.stringify(results));
