"""dataset: tokenizer and datasets, chat examples -> (input_ids, labels), packing, the launcher's mask check.
May import contract only; never another train folder."""
