"""The examples of the Hugging Face and Accelerate how-tos, run by tests/share/test_hf.py: a
``Trainer`` (a tiny BERT, on CPU) and an Accelerate loop, each reading a shared producer.
Each process writes the dataset indices it trained on, epoch by epoch, and its producer.

    python tests/share/hf_examples.py {trainer,accelerate} OUT_DIR
"""

import json
import os
import sys

import datasets
import torch
import transformers

from tandem.share import DataLoader, shared

N = 64


class Items(torch.utils.data.Dataset):
    def __len__(self):
        return N

    def __getitem__(self, i):
        return torch.full((4,), float(i)), i


def trainer_run(out):
    from tandem.share.hf import SharedTrainer

    class Recording(SharedTrainer):
        """The example's trainer, recording the dataset indices of each batch it trains on."""

        seen: list = []

        def get_train_dataloader(self):
            self.loader = super().get_train_dataloader()
            return self.loader

        def training_step(self, *args, **kwargs):
            self.seen += self.loader.last_indices.tolist()
            return super().training_step(*args, **kwargs)

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 90, (N, 8), generator=g).tolist()
    train = datasets.Dataset.from_dict(
        {
            "input_ids": ids,
            "attention_mask": [[1] * 8] * N,
            "labels": [i % 2 for i in range(N)],
            "note": [f"sample {i}" for i in range(N)],
        }  # a column the model does not take: removed
    )
    config = transformers.BertConfig(
        vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    model = transformers.BertForSequenceClassification(config)
    args = transformers.TrainingArguments(
        output_dir=os.path.join(out, "trainer"),
        per_device_train_batch_size=8,
        num_train_epochs=2,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = Recording(
        model=model, args=args, train_dataset=train, data_collator=transformers.default_data_collator
    )
    trainer.train()
    per_epoch = N // args.world_size  # this rank's part of each epoch
    return trainer.loader, [trainer.seen[i : i + per_epoch] for i in range(0, len(trainer.seen), per_epoch)]


def accelerate_run(out):
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(Items(), batch_size=8, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    loader = shared(loader)
    epochs = []
    for _ in range(2):
        epochs.append([])
        for x, idx in loader:
            assert torch.equal(x[:, 0].long(), idx)
            loss = model(x).pow(2).mean()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            epochs[-1] += idx.tolist()
    return loader, epochs


if __name__ == "__main__":
    mode, out = sys.argv[1], sys.argv[2]
    loader, epochs = (trainer_run if mode == "trainer" else accelerate_run)(out)
    rank = int(os.environ.get("RANK", "0"))
    result = {
        "epochs": epochs,
        "drop_in": isinstance(loader, DataLoader),
        "share": loader._plan.name if loader._plan else None,
        "producer": loader._consumer.producer_pid if loader._consumer else None,
    }
    with open(os.path.join(out, f"{mode}-{rank}-{os.getpid()}.json"), "w") as f:
        json.dump(result, f)
