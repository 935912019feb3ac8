"""A GRPO trainer's read loop over the sidecar's output, without the model: for each complete
group it builds the veRL-style tensors and the group-relative advantages, and prints them.
Put your model's loss where the comment says.

    PYTHONPATH=clients/python python3 examples/python-trainer/train.py --data-dir data --group-size 3
    PYTHONPATH=clients/python python3 examples/python-trainer/train.py --brokers kafka:9092 --group-size 8

With --data-dir it reads the file exporter's output that is there now and stops; with --brokers
it waits for groups on the Kafka topics (in the consumer group 'example-trainer').
"""
import argparse
import statistics

from lightning_sidecar_client import iter_groups, to_verl_batch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument('--group-size', type=int, required=True)
    p.add_argument('--data-dir')
    p.add_argument('--brokers')
    p.add_argument('--state', help='groups already trained on, kept across restarts')
    a = p.parse_args()
    source = {'data_dir': a.data_dir} if a.data_dir else {'brokers': a.brokers, 'consumer_group': 'example-trainer'}

    for group in iter_groups(a.group_size, state_path=a.state, **source):
        batch = to_verl_batch(group, pad_token_id=0, use_numpy=False)
        rewards = [e['final_reward'] or 0.0 for e in group['episodes']]
        mean, std = statistics.fmean(rewards), statistics.pstdev(rewards)
        advantage_of = {e['rollout_id']: (r - mean) / (std + 1e-6) for e, r in zip(group['episodes'], rewards)}
        advantages = [advantage_of[rid] for rid in batch['rollout_id']]  # group-relative, one per row
        rows, width = len(batch['input_ids']), len(batch['input_ids'][0]) if batch['input_ids'] else 0
        print(f"group {group['uid']}: {len(group['episodes'])} episodes, {rows} rows x {width} tokens, "
              f"rewards {rewards}, advantages {[round(x, 3) for x in advantages]}, "
              + (f"calls left out of trajectories {group['unmerged_calls']}" if 'unmerged_calls' in group
                 else f"skipped (no token ids) {group['skipped_no_token_ids']}"))
        # Here the trainer computes its GRPO loss from batch['input_ids'], batch['attention_mask'],
        # batch['response_mask'], batch['old_log_probs'] and the advantages, and steps its optimizer.


if __name__ == '__main__':
    main()
