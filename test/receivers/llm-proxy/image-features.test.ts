import { journaledFeatures, placeFeatures, readRender } from '../../../src/receivers/llm-proxy/token-in/image-features';

/** Token-in with images: the render's features placed on the runs of the prompt the sidecar sends. */

const PAD = 151655;

describe('image features for a token-in prompt', () => {
  const features = {
    mm_hashes: { image: ['a', 'b'] },
    mm_placeholders: {
      image: [
        { offset: 3, length: 2 },
        { offset: 9, length: 3 },
      ],
    },
    kwargs_data: { image: ['AAAA', 'BBBB'] },
  };

  it('moves each placeholder onto the k-th run of the prompt, keeping the rest', () => {
    // The spliced prompt put the images elsewhere than the render did.
    const prompt = [1, 2, 3, 4, 5, PAD, PAD, 6, 7, PAD, PAD, PAD, 8];
    expect(placeFeatures(prompt, features, PAD)).toEqual({
      ...features,
      mm_placeholders: {
        image: [
          { offset: 5, length: 2 },
          { offset: 9, length: 3 },
        ],
      },
    });
  });

  it('refuses runs that do not line up: another count, another length', () => {
    expect(placeFeatures([PAD, PAD, 1], features, PAD)).toBeNull();
    expect(placeFeatures([PAD, PAD, PAD, 1, PAD, PAD, PAD], features, PAD)).toBeNull();
    expect(placeFeatures([1, 2], features, PAD)).toBeNull();
  });

  it('journals the features without the processed data', () => {
    expect(journaledFeatures(features)).toEqual({ ...features, kwargs_data: { image: [null, null] }, kwargs_data_elided: true });
    expect(journaledFeatures({ mm_hashes: {} })).toEqual({ mm_hashes: {} });
  });

  it('reads the render answer: a GenerateRequest, not the older list shape', () => {
    expect(readRender(Buffer.from(JSON.stringify({ token_ids: [1, 2], features: null })))).toEqual({ tokens: [1, 2], features: null });
    expect(readRender(Buffer.from(JSON.stringify([{}, [{ prompt_token_ids: [1] }]])))).toBeNull();
    expect(readRender(Buffer.from('{"token_ids":[-1]}'))).toBeNull();
    expect(readRender(Buffer.from('not json'))).toBeNull();
  });
});
