package s3

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/agentfleet/agentfleet/pkg/storage"
)

// abortTimeout bounds the AbortMultipartUpload sent after a failed upload.
const abortTimeout = 30 * time.Second

// PutStream implements storage.StreamPutter. A stream that fits in one part
// (Config.PartSize) is sent as one PutObject; a longer one as a multipart
// upload whose parts all have exactly PartSize bytes except the last (R2
// requires equal parts). Only one part is held in memory at a time, and each
// part is a seekable buffer, so the SDK never uses aws-chunked encoding. If
// reading or uploading fails, the upload is aborted and the previous value
// of key (if any) stays in place.
func (s *Store) PutStream(ctx context.Context, key string, r io.Reader) error {
	if err := s.begin(ctx, "put stream", key); err != nil {
		return err
	}
	return s.putStream(ctx, key, r)
}

func (s *Store) putStream(ctx context.Context, key string, r io.Reader) error {
	// Read up to one part; a short stream never starts a multipart upload,
	// and a short stream does not cost a whole part of memory.
	var first bytes.Buffer
	n, err := io.CopyN(&first, r, s.partSize)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("s3: put stream %q: read: %w", key, err)
	}
	if n < s.partSize {
		return s.putObject(ctx, "put stream", key, first.Bytes(), false)
	}
	return s.multipart(ctx, key, first.Bytes(), r)
}

// multipart uploads first and then the rest of r as parts of s.partSize.
func (s *Store) multipart(ctx context.Context, key string, first []byte, r io.Reader) (err error) {
	rctx, cancel := s.opCtx(ctx)
	created, err := s.client.CreateMultipartUpload(rctx, &awss3.CreateMultipartUploadInput{
		Bucket: aws.String(s.bucket),
		Key:    aws.String(s.object(key)),
	})
	cancel()
	if err != nil {
		return s.wrap("put stream: create multipart upload", key, err)
	}
	uploadID := created.UploadId
	completed := false
	defer func() {
		if completed {
			return
		}
		actx, acancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
		defer acancel()
		_, aerr := s.client.AbortMultipartUpload(actx, &awss3.AbortMultipartUploadInput{
			Bucket:   aws.String(s.bucket),
			Key:      aws.String(s.object(key)),
			UploadId: uploadID,
		})
		if aerr != nil {
			// The bucket's lifecycle rule for incomplete uploads is the backstop.
			s.log.Warn().Err(aerr).Str("key", key).Msg("abort multipart upload failed; parts stay until the bucket's lifecycle rule removes them")
		}
	}()

	var parts []types.CompletedPart
	upload := func(b []byte) error {
		num := int32(len(parts) + 1)
		if num > MaxParts {
			return fmt.Errorf("s3: put stream %q: more than %d parts of %d bytes: %w", key, MaxParts, s.partSize, storage.ErrTooLarge)
		}
		pctx, pcancel := s.opCtx(ctx)
		defer pcancel()
		out, err := s.client.UploadPart(pctx, &awss3.UploadPartInput{
			Bucket:        aws.String(s.bucket),
			Key:           aws.String(s.object(key)),
			UploadId:      uploadID,
			PartNumber:    aws.Int32(num),
			Body:          bytes.NewReader(b),
			ContentLength: aws.Int64(int64(len(b))),
		})
		if err != nil {
			return s.wrap(fmt.Sprintf("put stream: upload part %d", num), key, err)
		}
		parts = append(parts, types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(num)})
		return nil
	}

	if err := upload(first); err != nil {
		return err
	}
	buf := make([]byte, s.partSize)
	for {
		n, rerr := io.ReadFull(r, buf)
		last := errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF)
		if rerr != nil && !last {
			return fmt.Errorf("s3: put stream %q: read: %w", key, rerr)
		}
		if n > 0 {
			if err := upload(buf[:n]); err != nil {
				return err
			}
		}
		if last {
			break
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("s3: put stream %q: %w", key, err)
	}
	cctx, ccancel := s.opCtx(ctx)
	defer ccancel()
	_, err = s.client.CompleteMultipartUpload(cctx, &awss3.CompleteMultipartUploadInput{
		Bucket:          aws.String(s.bucket),
		Key:             aws.String(s.object(key)),
		UploadId:        uploadID,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: parts},
	})
	if err != nil {
		return s.wrap("put stream: complete multipart upload", key, err)
	}
	completed = true
	return nil
}
